"""The `postjob` command, through the installed script."""
