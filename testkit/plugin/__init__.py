"""What KubeVirt's Plugins (VEP 190) do to a domain: the libvirt-go-xml-module round trip
(:mod:`.libvirtxml`) and virt-launcher v1.9.0's define with legacy hooks and plugins
(:mod:`.pipeline`)."""
