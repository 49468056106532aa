8
6	us-east-1€’³Ø €ĞÄÏ¢4*0.1.02geostate.deltas:<:
statesurge/9q8yy$"
1.8€€¨±ãŸçË	eu-west-1