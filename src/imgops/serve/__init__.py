"""`imgops serve` and the command line's relay to it: a warm process that runs later commands
(imgops.serve.server), the socket's protocol (imgops.serve.protocol), the caller's side
(imgops.serve.client). Nothing here imports click or the command line."""
