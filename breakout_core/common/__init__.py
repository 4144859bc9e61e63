"""What every room uses: files written whole, hashes, the CPU's flags and usable cores, one-line
messages."""
