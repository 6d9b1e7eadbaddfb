"""What the commands share beyond the plumbing: the node commands (capture, doctor) and the check's report."""
