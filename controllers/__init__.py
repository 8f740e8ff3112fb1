"""The OpenFlow 1.3 controller: os-ken apps (apps/) that apply routes computed by pure functions (routing/). Imports only testbed.model besides itself."""
