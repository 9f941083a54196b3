"""The SWOP: one per host; runs the tasks assigned to its taskrunner."""
