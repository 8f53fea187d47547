"""Rows of known binary and varied content for mariadb_user.sh.

Writes, into the folder given:
  blobs.sql   the table and one INSERT per row, each value a _binary
              string literal of its raw bytes (only the bytes the SQL
              parser or the client's line reader would take for something
              else are escaped), so the client sends the bytes themselves;
  blobs.want  "id length md5 sha256" per row, as the server's
              SELECT id, LENGTH(b), MD5(b), SHA2(b, 256) prints them;
  blobs.raw   every value followed by a newline, in id order: what
              `mysql --batch --raw --skip-column-names` prints for
              SELECT b ORDER BY id.
Prints the number of rows and of bytes.
"""
import hashlib
import random
import re
import sys

rng = random.Random(20261128)


def random_bytes(n):
    return rng.getrandbits(8 * n).to_bytes(n, "little") if n else b""


def awkward(n):
    """Bytes the escaping and the client's reader must get right."""
    unit = b"\\'\"\x00\n\r\t\x1a%_;" + bytes(range(0x80, 0x100))
    return (unit * (n // len(unit) + 1))[:n]


def text(n):
    unit = "naïve café 漢字 😀 ; -- ' \" \\\n".encode("utf-8")
    return (unit * (n // len(unit) + 1))[:n]


rows = [
    b"",
    b"\x00",
    bytes(range(256)),
    random_bytes(4095),
    awkward(65536),
    random_bytes(65537),
    text(300000),
    random_bytes(524288),
    awkward(1048576),
    random_bytes(1048576),
]

escapes = {b"\\": b"\\\\", b"'": b"\\'", b"\x00": b"\\0", b"\n": b"\\n", b"\r": b"\\r", b"\x1a": b"\\Z"}
special = re.compile(rb"[\\'\x00\n\r\x1a]")


def literal(value):
    return b"_binary'" + special.sub(lambda m: escapes[m.group(0)], value) + b"'"


out = sys.argv[1]
with open(f"{out}/blobs.sql", "wb") as sql:
    sql.write(b"DROP DATABASE IF EXISTS it;\nCREATE DATABASE it;\nCREATE TABLE it.blobs (id INT PRIMARY KEY, b LONGBLOB NOT NULL) ENGINE=InnoDB;\n")
    for i, value in enumerate(rows, 1):
        sql.write(b"INSERT INTO it.blobs VALUES (%d, " % i + literal(value) + b");\n")
with open(f"{out}/blobs.want", "w") as want:
    for i, value in enumerate(rows, 1):
        want.write(f"{i}\t{len(value)}\t{hashlib.md5(value).hexdigest()}\t{hashlib.sha256(value).hexdigest()}\n")
with open(f"{out}/blobs.raw", "wb") as raw:
    for value in rows:
        raw.write(value + b"\n")
print(len(rows), sum(len(v) for v in rows))
