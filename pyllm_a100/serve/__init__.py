"""Serving: a config becomes llama-server's argv (server), a child process (process) under a
supervisor (service) with state under PYLLM_HOME (state), crash translation (failures), RPC workers
(rpc), ports and addresses (net), and slot advice (slots)."""
