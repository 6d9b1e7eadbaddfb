"""pcitopo's doors: the CLI (pcitopo, xmlfix), the gRPC hook server and the shim entry point."""
