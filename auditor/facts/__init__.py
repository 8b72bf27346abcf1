"""Facts the other floors share and that import nothing of the auditor: units, glibc's heap,
which frames are the program's."""
