"""The few primitives both the machine layer (testbed.apply) and measurement (testbed.measure)
need, so that neither imports the other: running a tool and stopping a process (``process``),
entering a network namespace (``netns``), the rtnetlink codec for qdiscs (``netlink``), the
kernel's packet counters (``counters``) and what OVS's tools print, parsed (``ovs_tables``).
It imports only the model and pure plans."""
