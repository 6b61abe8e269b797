"""Serving: a request (options) is checked (validate), resolved once into a frozen config (resolve: placement for
the devices, tensor_mode for what a tensor split needs, sizing for the KV pool; config), turned into llama-server's command line (argv, with the user's own
flags read through llama_flags), launched and supervised (launch; the process itself: server), kept on disk
(persist: request.json; state: state.json and the listing), shown as Prometheus text (metrics) and installed as
a systemd unit (systemd)."""
