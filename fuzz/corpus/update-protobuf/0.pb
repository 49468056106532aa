
requests/9q8yy"evt-1(€Ð•ÿ¼1