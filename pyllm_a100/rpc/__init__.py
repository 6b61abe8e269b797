"""llama.cpp's RPC backend, in one place: one model's layers over several processes or machines.

protocol (worker endpoints and the handshake), devices (the devices llama.cpp will see, and their order), worker
(WorkerOptions, the one definition of `pyllm rpc-worker`, and the supervised rpc-server) and inprocess (a worker's
devices registered for ``Llama(rpc=...)``).
"""
