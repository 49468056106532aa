
zones/9q8yyclosed2€€¨±ãŸçË