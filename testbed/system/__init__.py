"""The few things both the machine layer (testbed.apply) and measurement (testbed.measure)
need, so that neither imports the other: the interface of a running fabric (``running``: apply
implements it, measurement and experiments use it), running a tool and stopping a process
(``process``), entering a network namespace (``netns``), the rtnetlink codec for qdiscs
(``netlink``), the kernel's packet counters (``counters``), the TCP ports a namespace listens
on (``sockets``) and what OVS's tools print, parsed (``ovs_tables``). It imports only the
model and pure plans."""
