
requests/9q8yy	eu-west-1



	eu-west-1)"
€ìäÀåÎ¸ı