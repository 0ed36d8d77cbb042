//! Mixed precision that means what it says: `--precision bf16` autocasts to bfloat16, not to libtorch's default
//! half type.
//!
//! `tch::autocast` only switches CUDA autocast on; the type it casts to is libtorch's per-device setting, float16
//! for CUDA unless someone sets it, and tch has no call for that. So bf16 used to run as fp16 autocast without
//! loss scaling. libtorch exports the setters (`at::autocast::set_autocast_dtype` and friends, plain functions of
//! two one-byte enums), so they are looked up in the already-loaded `libtorch_cpu` by their mangled names, as
//! [`crate::cuda`] loads `libtorch_cuda`. The same code drives CPU autocast, which is how the CPU tests check the
//! type in effect.
//!
//! Training policy: trainable encoders keep fp32 weights and run under autocast (bf16); frozen weights (a frozen
//! document encoder, the base of a LoRA one) are stored in bf16. fp16 is refused for training: without loss
//! scaling its gradients underflow, and every GPU this appliance supports (Ampere and later) has bf16.

use std::sync::OnceLock;

use care_formats::trainer::Precision;
use tch::{Device, Kind};

/// What the trainer makes of a run's [`Precision`] (the contract's enum, `care_formats::trainer`): the autocast
/// type, the storage type of frozen weights, and whether it can train.
pub trait PrecisionExt: Copy {
    /// The autocast type, `None` for fp32.
    fn autocast_kind(self) -> Option<Kind>;
    /// The storage type of frozen weights on `dev` (the CPU stays fp32: its bf16 kernels are slow and the CPU path
    /// is the reference).
    fn frozen_kind(self, dev: Device) -> Kind;
    /// Refuses precisions that cannot train (fp16 without loss scaling).
    fn check_trainable(self) -> Result<(), String>;
}

impl PrecisionExt for Precision {
    fn autocast_kind(self) -> Option<Kind> {
        match self {
            Self::Fp32 => None,
            Self::Bf16 => Some(Kind::BFloat16),
            Self::Fp16 => Some(Kind::Half),
        }
    }

    fn frozen_kind(self, dev: Device) -> Kind {
        match (self, dev) {
            (_, Device::Cpu) | (Self::Fp32, _) => Kind::Float,
            (Self::Bf16, _) => Kind::BFloat16,
            (Self::Fp16, _) => Kind::Half,
        }
    }

    fn check_trainable(self) -> Result<(), String> {
        match self {
            Self::Fp16 => Err("--precision fp16 cannot train: without loss scaling its gradients underflow to zero; \
                               use bf16 (every GPU since Ampere has it) or fp32"
                .into()),
            Self::Fp32 | Self::Bf16 => Ok(()),
        }
    }
}

/// c10::DeviceType values libtorch's autocast keys on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i8)]
pub enum AutocastDevice {
    Cpu = 0,
    Cuda = 1,
}

fn scalar_type(k: Kind) -> i8 {
    // c10::ScalarType numbering (stable since libtorch 1.x): Half 5, Float 6, BFloat16 15. Autocast only ever
    // targets these three; an `if` chain rather than a `match` because tch releases differ in their Kind variants.
    if k == Kind::Half {
        5
    } else if k == Kind::BFloat16 {
        15
    } else {
        6
    }
}

fn kind_of(s: i8) -> Option<Kind> {
    match s {
        5 => Some(Kind::Half),
        6 => Some(Kind::Float),
        15 => Some(Kind::BFloat16),
        _ => None,
    }
}

#[allow(unsafe_code)]
mod ffi {
    use libloading::os::unix::{Library, Symbol};

    pub type SetDtype = unsafe extern "C" fn(i8, i8);
    pub type GetDtype = unsafe extern "C" fn(i8) -> i8;
    pub type SetEnabled = unsafe extern "C" fn(i8, bool);
    pub type IsEnabled = unsafe extern "C" fn(i8) -> bool;
    pub type Nesting = unsafe extern "C" fn() -> i64;
    pub type Clear = unsafe extern "C" fn();

    #[derive(Debug)]
    pub struct Api {
        pub set_dtype: Symbol<SetDtype>,
        pub get_dtype: Symbol<GetDtype>,
        pub set_enabled: Symbol<SetEnabled>,
        pub is_enabled: Symbol<IsEnabled>,
        pub inc: Symbol<Nesting>,
        pub dec: Symbol<Nesting>,
        pub clear: Symbol<Clear>,
    }

    /// Looks the functions up in the process's global scope, where the executable's own `libtorch_cpu` is.
    pub fn load() -> Result<Api, String> {
        let this = Library::this();
        // SAFETY: the signatures are libtorch's (`void set_autocast_dtype(c10::DeviceType, c10::ScalarType)` etc.,
        // both enums `int8_t`-based, passed in integer registers like `i8`); the symbols come from the libtorch
        // this binary was linked against, and `Library::this()` is never closed.
        unsafe {
            macro_rules! sym {
                ($name:literal, $ty:ty) => {
                    this.get::<$ty>($name).map_err(|e| {
                        format!("libtorch lacks {}: {e}", String::from_utf8_lossy(&$name[..$name.len() - 1]))
                    })?
                };
            }
            Ok(Api {
                set_dtype: sym!(b"_ZN2at8autocast18set_autocast_dtypeEN3c1010DeviceTypeENS1_10ScalarTypeE\0", SetDtype),
                get_dtype: sym!(b"_ZN2at8autocast18get_autocast_dtypeEN3c1010DeviceTypeE\0", GetDtype),
                set_enabled: sym!(b"_ZN2at8autocast20set_autocast_enabledEN3c1010DeviceTypeEb\0", SetEnabled),
                is_enabled: sym!(b"_ZN2at8autocast19is_autocast_enabledEN3c1010DeviceTypeE\0", IsEnabled),
                inc: sym!(b"_ZN2at8autocast17increment_nestingEv\0", Nesting),
                dec: sym!(b"_ZN2at8autocast17decrement_nestingEv\0", Nesting),
                clear: sym!(b"_ZN2at8autocast11clear_cacheEv\0", Clear),
            })
        }
    }
}

fn api() -> Result<&'static ffi::Api, String> {
    static API: OnceLock<Result<ffi::Api, String>> = OnceLock::new();
    API.get_or_init(ffi::load).as_ref().map_err(Clone::clone)
}

/// The autocast type libtorch has in effect for `dev` (what a matmul under autocast produces).
#[allow(unsafe_code)]
pub fn autocast_dtype(dev: AutocastDevice) -> Result<Kind, String> {
    let a = api()?;
    // SAFETY: see ffi::load.
    let s = unsafe { (a.get_dtype)(dev as i8) };
    kind_of(s).ok_or_else(|| format!("libtorch reports autocast scalar type {s}"))
}

/// Whether autocast is on for `dev`.
#[allow(unsafe_code)]
pub fn autocast_enabled(dev: AutocastDevice) -> Result<bool, String> {
    let a = api()?;
    // SAFETY: see ffi::load.
    Ok(unsafe { (a.is_enabled)(dev as i8) })
}

/// Runs `f` with autocast to `kind` on `dev` (`None`: autocast off), restoring the previous state afterwards, as
/// `torch.autocast` does (nesting count, cast cache cleared when the outermost region ends).
#[allow(unsafe_code)]
pub fn with_autocast<T>(dev: AutocastDevice, kind: Option<Kind>, f: impl FnOnce() -> T) -> Result<T, String> {
    let a = api()?;
    let d = dev as i8;
    // SAFETY: see ffi::load; these only read and write libtorch's thread-local autocast state.
    let (prev_on, prev_dtype) = unsafe { ((a.is_enabled)(d), (a.get_dtype)(d)) };
    unsafe {
        if let Some(k) = kind {
            (a.set_dtype)(d, scalar_type(k));
        }
        (a.set_enabled)(d, kind.is_some());
        (a.inc)();
    }
    let out = f();
    unsafe {
        if (a.dec)() == 0 {
            (a.clear)();
        }
        (a.set_enabled)(d, prev_on);
        (a.set_dtype)(d, prev_dtype);
    }
    Ok(out)
}

/// Autocast for training on `dev` at `p`: CUDA autocast to the precision's type; the CPU (and fp32) run as is.
pub fn train_autocast<T>(dev: Device, p: Precision, f: impl FnOnce() -> T) -> Result<T, String> {
    match (dev, p.autocast_kind()) {
        (Device::Cuda(_), Some(k)) => with_autocast(AutocastDevice::Cuda, Some(k), f),
        _ => Ok(f()),
    }
}

/// Runs `f` with autocast off on every device (the loss in fp32 under a bf16 step).
pub fn without_autocast<T>(f: impl FnOnce() -> T) -> T {
    let on = |d| autocast_enabled(d).unwrap_or(false);
    let (cpu, cuda) = (on(AutocastDevice::Cpu), on(AutocastDevice::Cuda));
    // Either flag being on proves the functions were found, so the `expect`s cannot fire.
    let g = move || if cuda { with_autocast(AutocastDevice::Cuda, None, f).expect("autocast loaded") } else { f() };
    if cpu { with_autocast(AutocastDevice::Cpu, None, g).expect("autocast loaded") } else { g() }
}
