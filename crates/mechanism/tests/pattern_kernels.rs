//! The pattern kernels agree with `pattern::word` byte for byte and count every differing
//! word: on the simulated device always, on the GPU where there is one.

use tiermem_mechanism::sim::SimDevice;
use tiermem_mechanism::{cuda::CudaDevice, pattern, Device, DeviceError, StreamPriority};

fn kernels_match_the_host_pattern(dev: &dyn Device) {
    let words = 3 * 1024 * 1024 / 8 + 5; // more than one grid of blocks, not a round number
    let buf = dev.alloc_plain(words * 8).unwrap();
    let counter = dev.alloc_plain(4).unwrap();
    dev.write(counter, &[0; 4]).unwrap();
    let stream = dev.create_stream(StreamPriority::High).unwrap();
    dev.fill_pattern_async(buf, words, 7, 1000, stream).unwrap();
    dev.synchronize_stream(stream).unwrap();
    let mut bytes = vec![0u8; words * 8];
    dev.read(buf, &mut bytes).unwrap();
    assert_eq!(pattern::first_mismatch(7, 8000, &bytes), None, "the fill kernel writes pattern::word");

    dev.check_pattern_async(buf, words, 7, 1000, counter, stream).unwrap();
    dev.write(buf + 8 * 12345, &[0xAA; 8]).unwrap(); // the check may run before or after this write
    dev.synchronize_stream(stream).unwrap();
    let mut count = [0u8; 4];
    dev.read(counter, &mut count).unwrap();
    let first = u32::from_le_bytes(count);
    assert!(first <= 1, "a check of intact words counts at most the word changed meanwhile: {first}");

    dev.write(counter, &[0; 4]).unwrap();
    dev.write(buf + 8 * 54321, &[0x55; 8]).unwrap();
    dev.check_pattern_async(buf, words, 7, 1000, counter, stream).unwrap();
    dev.check_pattern_async(buf, words, 8, 1000, counter, stream).unwrap(); // another seed: all differ
    dev.synchronize_stream(stream).unwrap();
    dev.read(counter, &mut count).unwrap();
    assert_eq!(u32::from_le_bytes(count) as usize, 2 + words, "2 changed words, then every word of another seed");

    dev.destroy_stream(stream).unwrap();
    dev.free_plain(counter).unwrap();
    dev.free_plain(buf).unwrap();
}

#[test]
fn sim_pattern_kernels_match_the_host_pattern() {
    kernels_match_the_host_pattern(&SimDevice::new(64 << 20).unwrap());
}

#[test]
fn gpu_pattern_kernels_match_the_host_pattern() {
    match CudaDevice::open(0) {
        Ok(dev) => kernels_match_the_host_pattern(&dev),
        Err(DeviceError::NoDriver(why) | DeviceError::NoDevice(why)) => eprintln!("skipped: {why}"),
        Err(other) => panic!("CudaDevice::open(0): {other}"),
    }
}
