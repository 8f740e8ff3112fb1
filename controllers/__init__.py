"""OpenFlow 1.3 controller apps (os-ken) and the pure route computation they apply."""
