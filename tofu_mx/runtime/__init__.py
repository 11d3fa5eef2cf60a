"""Running a plan: what each device computes (assign), the partitioned symbol and its
parameters (partitioned), checkpoints in the ordinary format."""
