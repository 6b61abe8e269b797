"""What a model needs of a machine, planned before anything loads: memory per device (memplan), the KV pool
and slots that fit beside the weights (capacity), and the bytes a token reads (roofline)."""
