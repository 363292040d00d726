"""What the driver answers about a pointer into VMM memory made of several physical chunks,
against one from cuMemAlloc: cuMemGetAddressRange_v2 and cuPointerGetAttribute's range start,
range size and legacy-IPC capability, for a pointer 40 MiB into 64 MiB mapped as two 32 MiB
chunks, and 1000 B into a cuMemAlloc of 100,000 B. One JSON line on stdout."""
import ctypes as C
import json

from vmm import Access, Location, Prop, cuda, ok, start

RANGE_START, RANGE_SIZE, LEGACY_IPC = 11, 12, 10  # CU_POINTER_ATTRIBUTE_*


def describe(ptr):
    base, size = C.c_ulonglong(), C.c_size_t()
    out = {"cuMemGetAddressRange": cuda.cuMemGetAddressRange_v2(C.byref(base), C.byref(size), C.c_ulonglong(ptr))}
    out.update(base_offset=ptr - base.value, size=size.value)
    for name, attr, kind in [("range_start", RANGE_START, C.c_ulonglong), ("range_size", RANGE_SIZE, C.c_size_t),
                             ("legacy_ipc", LEGACY_IPC, C.c_int)]:
        value = kind()
        r = cuda.cuPointerGetAttribute(C.byref(value), attr, C.c_ulonglong(ptr))
        out[name] = (value.value - ptr if name == "range_start" else value.value) if r == 0 else f"CUresult {r}"
    return out


def main():
    dev, _ = start()
    chunk = 32 << 20
    va = C.c_ulonglong()
    ok(cuda.cuMemAddressReserve(C.byref(va), C.c_size_t(2 * chunk), C.c_size_t(0), C.c_ulonglong(0), C.c_ulonglong(0)), "reserve")
    prop = Prop()
    prop.type, prop.location = 1, Location(1, dev.value)
    handles = []
    for i in range(2):
        h = C.c_ulonglong()
        ok(cuda.cuMemCreate(C.byref(h), C.c_size_t(chunk), C.byref(prop), C.c_ulonglong(0)), "create")
        ok(cuda.cuMemMap(C.c_ulonglong(va.value + i * chunk), C.c_size_t(chunk), C.c_size_t(0), h, C.c_ulonglong(0)), "map")
        handles.append(h)
    access = Access(Location(1, dev.value), 3)
    ok(cuda.cuMemSetAccess(va, C.c_size_t(2 * chunk), C.byref(access), C.c_size_t(1)), "access")
    plain = C.c_ulonglong()
    ok(cuda.cuMemAlloc_v2(C.byref(plain), C.c_size_t(100000)), "cuMemAlloc")
    print(json.dumps({"vmm_40MiB_in": describe(va.value + (40 << 20)), "vmm_start": describe(va.value),
                      "cuMemAlloc_1000_in": describe(plain.value + 1000)}))


if __name__ == "__main__":
    main()
