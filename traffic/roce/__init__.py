"""A user-space RoCEv2 reliable-connected transport over UDP sockets, with DCQCN and
DCTCP-style congestion control: wire format (``wire``), PSN arithmetic (``psn``), the RC
requester and responder as pure state machines (``rc``), per-QP congestion control
(``cc``), a verbs-shaped interface (``verbs``), the socket engine (``engine``), the program
run inside emulated hosts (``host``) and a loopback benchmark (``bench``)."""
