"""Checks of a host and a guest: the doctor's findings, kubelet's CPU placement, verify inside the guest."""
