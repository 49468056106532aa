

	eu-west-1