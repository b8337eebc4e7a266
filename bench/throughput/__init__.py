"""The parts of the end-to-end throughput benchmark (``bench/bench_throughput.py``): what it
submits (``scenarios``), its pure figures and settings (``figures``), the peers it compares with
(``peers``), where the CPU and the database's work go (``accounting``) and what it prints
(``report``)."""
