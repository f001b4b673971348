# nbdkit Python plugin: serves a sparse file and appends every modifying
# request to a text trace, so we can see what kernel btrfs sends to a disk.
#
#   nbdkit python scripts/nbdkit-trace-plugin.py file=DISK trace=TRACE
#
# Requests are serialized (one at a time), so the trace order is the order
# the server completed them. Trace lines (format read by
# nbd/src/safepoint/replay.rs):
#
#   W <offset> <length> <fua 0|1> [<at>=<hex>]...   write
#   Z <offset> <length> <fua 0|1>                   write zeroes
#   T <offset> <length> <fua 0|1>                   trim
#   F                                               flush
#   # <text>                                        comment (from the driver)
#
# A write carries its data (`<at>=<hex>`, `at` the absolute byte offset of
# the first byte shown) only for the part that overlaps one of the three
# btrfs superblock copies (64 KiB, 64 MiB, 256 GiB; 4 KiB each), which keeps
# the trace small. Reads are not recorded.

import os
import ctypes

import nbdkit

API_VERSION = 2

SUPER_SIZE = 4096
CAPTURED = (65536, 64 << 20, 256 << 30)

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02

disk_path = None
trace_path = None
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def config(key, value):
    global disk_path, trace_path
    if key == "file":
        disk_path = value
    elif key == "trace":
        trace_path = value
    else:
        raise RuntimeError("unknown parameter " + key)


def config_complete():
    if disk_path is None or trace_path is None:
        raise RuntimeError("file= and trace= are required")


def thread_model():
    return nbdkit.THREAD_MODEL_SERIALIZE_ALL_REQUESTS


class Handle:
    def __init__(self, readonly):
        self.fd = os.open(disk_path, os.O_RDONLY if readonly else os.O_RDWR)
        # O_APPEND: the driver script appends comment lines to the same file.
        self.trace = os.open(trace_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(self, line):
        os.write(self.trace, (line + "\n").encode())


def open(readonly):
    return Handle(readonly)


def close(h):
    os.close(h.fd)
    os.close(h.trace)


def get_size(h):
    return os.fstat(h.fd).st_size


def can_write(h):
    return True


def can_flush(h):
    return True


def can_trim(h):
    return True


def can_zero(h):
    return True


def can_fua(h):
    # NATIVE so that pwrite sees the FUA flag (EMULATE would hide it behind
    # a flush of nbdkit's own).
    return nbdkit.FUA_NATIVE


def can_multi_conn(h):
    return False


def pread(h, buf, offset, flags):
    n = len(buf)
    data = os.pread(h.fd, n, offset)
    buf[:len(data)] = data
    if len(data) < n:
        buf[len(data):] = bytes(n - len(data))


def fua_flag(flags):
    return 1 if flags & nbdkit.FLAG_FUA else 0


def captured(buf, offset):
    parts = []
    end = offset + len(buf)
    for start in CAPTURED:
        lo, hi = max(offset, start), min(end, start + SUPER_SIZE)
        if lo < hi:
            parts.append("%d=%s" % (lo, bytes(buf[lo - offset:hi - offset]).hex()))
    return parts


def pwrite(h, buf, offset, flags):
    done = 0
    while done < len(buf):
        done += os.pwrite(h.fd, buf[done:], offset + done)
    if flags & nbdkit.FLAG_FUA:
        os.fdatasync(h.fd)
    h.log(" ".join(["W", str(offset), str(len(buf)), str(fua_flag(flags))] + captured(buf, offset)))


def flush(h, flags):
    os.fdatasync(h.fd)
    h.log("F")


def punch(h, count, offset):
    if libc.fallocate(h.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, count) != 0:
        e = ctypes.get_errno()
        nbdkit.set_error(e)
        raise OSError(e, os.strerror(e))


def trim(h, count, offset, flags):
    punch(h, count, offset)
    h.log("T %d %d %d" % (offset, count, fua_flag(flags)))


def zero(h, count, offset, flags):
    # A punched hole reads back as zeros, whether or not MAY_TRIM was given.
    punch(h, count, offset)
    h.log("Z %d %d %d" % (offset, count, fua_flag(flags)))
