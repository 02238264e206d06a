"""One module per section of the config file, each with the settings of one subsystem."""
