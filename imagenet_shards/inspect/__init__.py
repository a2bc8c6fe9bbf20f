"""See a dataset without opening 150 GB: statistics, a contact sheet, one sample's exact bytes.

    reading.py      open any PATH the loader reads; pick samples by seed; read only those
    statistics.py   figures from the index (every sample) and from the samples read
    sheet.py        the contact sheet (labelled tiles, class / size / resolution histograms)
    cli.py          what inspect_dataset.py prints and writes, and its exit codes
"""
