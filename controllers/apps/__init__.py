"""os-ken apps, one per concern (forwarding, proxy ARP, port statistics, LLDP wiring check), their launcher and settings."""
