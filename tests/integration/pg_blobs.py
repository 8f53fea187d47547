"""Rows of random bytes for pg_cluster.sh, in PostgreSQL's binary COPY format.

Writes, into the folder given:
  blobs.copy  the rows (id int4, b bytea) as `COPY ... FROM ... (FORMAT
              binary)` reads them: psql's \\copy sends the file's bytes as
              they are, so every value crosses the connection raw, not
              escaped; the server writes the same file back for
              `COPY (SELECT id, b FROM blobs ORDER BY id) TO ... (FORMAT
              binary)`, so a read-back compares with cmp;
  blobs.want  "id|length|md5" per row, md5 taken here, as psql -A -t
              prints SELECT id, length(b), md5(b) ORDER BY id.
Prints the number of rows and of bytes.
"""
import hashlib
import os
import struct
import sys

sizes = [0, 1, 256, 4095, 65537, 300000, 1048575, 1048576]


def value(n):
    # One row of every byte value in order; the rest random.
    return bytes(range(256)) if n == 256 else os.urandom(n)


out = sys.argv[1]
total = 0
with open(f"{out}/blobs.copy", "wb") as copy, open(f"{out}/blobs.want", "w") as want:
    # Signature, flags (no OIDs), header extension length.
    copy.write(b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0))
    for i, n in enumerate(sizes, start=1):
        b = value(n)
        copy.write(struct.pack("!hii", 2, 4, i) + struct.pack("!i", n) + b)
        want.write(f"{i}|{n}|{hashlib.md5(b).hexdigest()}\n")
        total += n
    copy.write(struct.pack("!h", -1))
print(len(sizes), total)
