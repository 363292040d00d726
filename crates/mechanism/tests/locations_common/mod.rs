//! Scenarios of chunk locations run on every backend (the `locations_*` tests): chunks in
//! this GPU's HBM copied between with `copy_between_devices_async`, a chunk in host memory
//! mapped and touched by the GPU, and a chunk in a neighbour's HBM mapped at this GPU's
//! address. Each checks the bytes, and gives everything it made back.
#![allow(dead_code)]

use tiermem_mechanism::{ChunkLocation, Device, DevicePtr, PhysHandle, StreamPriority};

/// `len` bytes that depend on `seed` and on each byte's position.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Reads `len` bytes at `va` through `dev`.
pub fn read(dev: &dyn Device, va: DevicePtr, len: usize) -> Vec<u8> {
    let mut back = vec![0u8; len];
    dev.read(va, &mut back).unwrap();
    back
}

/// A reservation of `chunks.len()` granules with `chunks[i]` mapped at granule `i`.
pub struct Mapped<'a> {
    pub dev: &'a dyn Device,
    pub va: DevicePtr,
    pub chunks: Vec<PhysHandle>,
}

impl<'a> Mapped<'a> {
    /// Creates one chunk at each of `locations` through `dev` and maps them in a new reservation.
    pub fn new(dev: &'a dyn Device, locations: &[ChunkLocation]) -> Self {
        let chunks = locations.iter().map(|&at| dev.create_chunk_at(at).unwrap()).collect();
        Self::of(dev, chunks)
    }

    /// Maps `chunks` in a new reservation of `dev`.
    pub fn of(dev: &'a dyn Device, chunks: Vec<PhysHandle>) -> Self {
        let g = dev.info().granularity;
        let va = dev.reserve(chunks.len() * g).unwrap();
        for (i, &chunk) in chunks.iter().enumerate() {
            dev.map(va + (i * g) as u64, chunk).unwrap();
        }
        Self { dev, va, chunks }
    }

    pub fn size(&self) -> usize {
        self.chunks.len() * self.dev.info().granularity
    }

    /// The address of granule `i`.
    pub fn at(&self, i: usize) -> DevicePtr {
        self.va + (i * self.dev.info().granularity) as u64
    }

    /// Unmaps and unreserves, handing the chunks back to release.
    pub fn unmap(self) -> Vec<PhysHandle> {
        self.dev.unmap(self.va, self.size()).unwrap();
        self.dev.unreserve(self.va, self.size()).unwrap();
        self.chunks
    }

    /// Unmaps, unreserves and releases the chunks.
    pub fn release(self) {
        let dev = self.dev;
        self.unmap().into_iter().for_each(|chunk| dev.release_chunk(chunk).unwrap());
    }
}

/// How many words of `words` at `src` differ from the pattern `seed`, counted by `dev`'s kernel.
pub fn differing(dev: &dyn Device, src: DevicePtr, words: usize, seed: u64) -> u32 {
    let counter = dev.alloc_plain(4).unwrap();
    dev.write(counter, &[0; 4]).unwrap();
    let stream = dev.create_stream(StreamPriority::High).unwrap();
    dev.check_pattern_async(src, words, seed, 0, counter, stream).unwrap();
    dev.synchronize_stream(stream).unwrap();
    let mut count = [0u8; 4];
    dev.read(counter, &mut count).unwrap();
    dev.destroy_stream(stream).unwrap();
    dev.free_plain(counter).unwrap();
    u32::from_le_bytes(count)
}

/// Two chunks created at this GPU's own location, with access from this GPU alone: bytes
/// written to one are copied to the other and to a plain allocation by
/// `copy_between_devices_async`, and the pattern kernels run over both.
pub fn copies_between_own_chunks(dev: &dyn Device) {
    let (g, own) = (dev.info().granularity, dev.info().ordinal);
    let m = Mapped::new(dev, &[ChunkLocation::Gpu(own), ChunkLocation::Gpu(own)]);
    dev.set_access_from(m.va, m.size(), &[own]).unwrap();
    let data = bytes(1, g);
    dev.write(m.at(0), &data).unwrap();
    let stream = dev.create_stream(StreamPriority::High).unwrap();
    dev.copy_between_devices_async(m.at(1), m.at(0), g, stream).unwrap();
    let plain = dev.alloc_plain(g).unwrap();
    dev.copy_between_devices_async(plain, m.at(1), g, stream).unwrap();
    dev.synchronize_stream(stream).unwrap();
    assert!(read(dev, m.at(1), g) == data, "the copy between chunks moved the bytes");
    assert!(read(dev, plain, g) == data, "the copy to a plain allocation moved the bytes");

    dev.fill_pattern_async(m.at(1), g / 8, 5, 0, stream).unwrap();
    dev.copy_between_devices_async(m.at(0), m.at(1), g, stream).unwrap();
    dev.synchronize_stream(stream).unwrap();
    assert_eq!(differing(dev, m.at(0), g / 8, 5), 0, "the kernel's pattern was copied whole");
    dev.destroy_stream(stream).unwrap();
    dev.free_plain(plain).unwrap();
    m.release();
}

/// A chunk in host memory mapped beside one in HBM, with access from this GPU: written and
/// read back, filled by a kernel and copied to HBM, and copied into from HBM. `Err` (the
/// reason) where the driver cannot create chunks in host memory.
pub fn host_chunk_is_addressable(dev: &dyn Device) -> Result<(), String> {
    let (g, own) = (dev.info().granularity, dev.info().ordinal);
    let host = match dev.create_chunk_at(ChunkLocation::Host) {
        Ok(chunk) => chunk,
        Err(tiermem_mechanism::DeviceError::Unsupported(why)) => return Err(why),
        Err(other) => panic!("create_chunk_at(Host): {other}"),
    };
    let m = Mapped::of(dev, vec![host, dev.create_chunk_at(ChunkLocation::Gpu(own)).unwrap()]);
    dev.set_access_from(m.va, m.size(), &[own]).unwrap();
    let data = bytes(2, g);
    dev.write(m.at(0), &data).unwrap();
    assert!(read(dev, m.at(0), g) == data, "a host chunk holds what was written through its mapping");

    let stream = dev.create_stream(StreamPriority::High).unwrap();
    dev.fill_pattern_async(m.at(0), g / 8, 6, 0, stream).unwrap();
    dev.copy_between_devices_async(m.at(1), m.at(0), g, stream).unwrap();
    dev.synchronize_stream(stream).unwrap();
    assert_eq!(differing(dev, m.at(1), g / 8, 6), 0, "a kernel filled the host chunk, a copy took it to HBM");

    dev.write(m.at(1), &data).unwrap();
    dev.copy_between_devices_async(m.at(0), m.at(1), g, stream).unwrap();
    dev.synchronize_stream(stream).unwrap();
    assert!(read(dev, m.at(0), g) == data, "a copy from HBM reached the host chunk");
    dev.destroy_stream(stream).unwrap();
    m.release();
    Ok(())
}

/// A chunk created on `there`'s GPU, mapped at `here`'s address beside a chunk of its own
/// with access from `here` alone: `here` writes it, fills it with a kernel, copies it to its
/// own HBM and back; `there`, mapping the same chunk at an address of its own, reads the
/// same bytes, so they really are in the one chunk on its GPU.
pub fn peer_chunk_mapped_here(here: &dyn Device, there: &dyn Device) {
    let (g, h, t) = (here.info().granularity, here.info().ordinal, there.info().ordinal);
    let m = Mapped::new(here, &[ChunkLocation::Gpu(t), ChunkLocation::Gpu(h)]);
    here.set_access_from(m.va, m.size(), &[h]).unwrap();
    let data = bytes(3, g);
    here.write(m.at(0), &data).unwrap();
    assert!(read(here, m.at(0), g) == data, "GPU {h} reads back what it wrote to a chunk on GPU {t}");

    let stream = here.create_stream(StreamPriority::High).unwrap();
    here.fill_pattern_async(m.at(0), g / 8, 7, 0, stream).unwrap();
    here.copy_between_devices_async(m.at(1), m.at(0), g, stream).unwrap();
    here.synchronize_stream(stream).unwrap();
    assert_eq!(differing(here, m.at(1), g / 8, 7), 0, "the peer chunk's pattern was copied to local HBM");

    here.write(m.at(1), &data).unwrap();
    here.copy_between_devices_async(m.at(0), m.at(1), g, stream).unwrap();
    here.synchronize_stream(stream).unwrap();
    here.destroy_stream(stream).unwrap();
    assert!(read(here, m.at(0), g) == data, "a copy from local HBM reached the peer chunk");

    let lender = Mapped::of(there, vec![m.chunks[0]]);
    there.set_access(lender.va, g).unwrap();
    assert!(read(there, lender.va, g) == data, "GPU {t} sees in its own chunk what GPU {h} wrote there");
    lender.unmap();
    m.release();
}
