"""The native side: where the compiled llama.cpp lives (native), the pinned source it is built from
(llama_source, also run by CMake as a script), and llama-cpp-python bound to it (bindings)."""
