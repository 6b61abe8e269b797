"""python -m lab.runs.gpu_check's steps, grouped by job: runner (results, step wrapper, logs), install (environment, build,
cuobjdump, test-llama-archs), compare (GPU vs CPU tokens and logits), multi_gpu (row split, two GPUs), serving
(soak, GLM-5, drafts, doctor, memory plan, nvfp4). Nothing in the package imports this one."""
