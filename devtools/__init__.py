"""Demo and test tools: the worker simulator, a local tritonserver, demo seeding, the GPU check."""
