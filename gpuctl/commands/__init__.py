"""gpuctl's commands, one module per group; gpuctl.cli puts argparse in front of them."""
