
drivers/9q8yyþÿÿÿÿÿÿÿÿ