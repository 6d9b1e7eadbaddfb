"""Checks of a host and a guest: the doctor, its fleet outputs, verify inside the guest."""
