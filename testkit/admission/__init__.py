"""Kubernetes admission policies (ValidatingAdmissionPolicy, MutatingAdmissionPolicy) evaluated
as kube-apiserver evaluates them, with a real CEL implementation (cel-python); see policy.py."""
