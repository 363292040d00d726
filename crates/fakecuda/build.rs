// The fake answers to the real driver's soname, so that dlopen("libcuda.so.1") and
// dlopen("libcuda.so") of a process find the one copy already loaded, as with the real driver.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
