



	eu-west-1)