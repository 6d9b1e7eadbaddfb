"""Reading a host: sysfs (live or captured), captures, configuration space, udev names."""
