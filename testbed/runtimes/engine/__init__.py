"""Docker engines: the client, the node image and its wheels, nodes supervised in containers."""
