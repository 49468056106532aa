
	eu-west-1€’³Øgeostate.updates"")*€€¨±ãŸçË2	