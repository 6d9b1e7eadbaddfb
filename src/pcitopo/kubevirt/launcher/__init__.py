"""The domain virt-launcher builds: KubeVirt's converter, per release, as the hook receives it at
the first ``OnDefineDomain`` / ``MutateDomain`` call (``pcitopo domain``, ``xmlfix --vmi`` with no
domain argument). Each rule names its KubeVirt file and function; docs/SOURCES.md lists them by
tag ("The domain virt-launcher builds")."""
