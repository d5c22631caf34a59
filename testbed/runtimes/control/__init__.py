"""The runner's end of the control channel: the hub, its rules, who may speak, the control network."""
