"""The loader daemon: `fastload serve`, its clients, and the link between them."""
