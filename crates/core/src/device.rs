//! Compute devices: the user's choice parsed once at the edge, and what libtorch reports.

use std::fmt;
use std::str::FromStr;

/// Where tensors live, as the user asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// CUDA when available, else CPU.
    #[default]
    Auto,
    Cpu,
    Cuda(usize),
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DeviceError {
    #[error("unknown device '{0}' (expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\")")]
    Unknown(String),
    #[error("device '{0}' asked for, but CUDA is not available on this machine")]
    NoCuda(String),
    #[error("device '{asked}' asked for, but only {count} CUDA device(s) exist")]
    NoSuchGpu { asked: String, count: usize },
}

impl FromStr for DeviceChoice {
    type Err = DeviceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" | "gpu" => Ok(DeviceChoice::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(|| DeviceError::Unknown(s.to_string())),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Auto => write!(f, "auto"),
            DeviceChoice::Cpu => write!(f, "cpu"),
            DeviceChoice::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl DeviceChoice {
    /// The concrete device, checking that CUDA exists when asked for.
    pub fn resolve(self) -> Result<tch::Device, DeviceError> {
        match self {
            DeviceChoice::Cpu => Ok(tch::Device::Cpu),
            DeviceChoice::Auto => Ok(if tch::Cuda::is_available() { tch::Device::Cuda(0) } else { tch::Device::Cpu }),
            DeviceChoice::Cuda(i) => {
                if !tch::Cuda::is_available() {
                    return Err(DeviceError::NoCuda(self.to_string()));
                }
                let count = tch::Cuda::device_count() as usize;
                if i >= count {
                    return Err(DeviceError::NoSuchGpu { asked: self.to_string(), count });
                }
                Ok(tch::Device::Cuda(i))
            }
        }
    }
}

pub fn device_name(d: tch::Device) -> String {
    match d {
        tch::Device::Cpu => "cpu".into(),
        tch::Device::Cuda(i) => format!("cuda:{i}"),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// What libtorch reports about this machine.
#[derive(Debug, Clone)]
pub struct TorchInfo {
    pub torch_version: &'static str,
    pub torch_lib: &'static str,
    pub cuda_available: bool,
    pub cudnn_available: bool,
    pub cuda_devices: usize,
    /// GPU names from `nvidia-smi` when it is installed.
    pub gpu_names: Vec<String>,
    pub threads: i32,
}

pub fn torch_info() -> TorchInfo {
    let cuda_available = tch::Cuda::is_available();
    let gpu_names = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect()
        })
        .unwrap_or_default();
    TorchInfo {
        torch_version: env!("HEADSCOPE_TORCH_VERSION"),
        torch_lib: env!("HEADSCOPE_TORCH_LIB"),
        cuda_available,
        cudnn_available: tch::Cuda::cudnn_is_available(),
        cuda_devices: if cuda_available { tch::Cuda::device_count() as usize } else { 0 },
        gpu_names,
        threads: tch::get_num_threads(),
    }
}

impl fmt::Display for TorchInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "torch:   {} ({})", self.torch_version, self.torch_lib)?;
        if self.cuda_available {
            let names =
                if self.gpu_names.is_empty() { String::new() } else { format!(": {}", self.gpu_names.join(", ")) };
            writeln!(
                f,
                "CUDA:    available, {} device(s){names}; cuDNN {}",
                self.cuda_devices,
                if self.cudnn_available { "available" } else { "not available" }
            )?;
        } else {
            writeln!(f, "CUDA:    not available (computing on CPU)")?;
        }
        write!(f, "threads: {}", self.threads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_names() {
        assert_eq!("auto".parse(), Ok(DeviceChoice::Auto));
        assert_eq!("cpu".parse(), Ok(DeviceChoice::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceChoice::Cuda(0)));
        assert_eq!("cuda:1".parse(), Ok(DeviceChoice::Cuda(1)));
        assert_eq!("tpu".parse::<DeviceChoice>(), Err(DeviceError::Unknown("tpu".into())));
        assert!("cuda:x".parse::<DeviceChoice>().is_err());
    }

    #[test]
    fn cuda_choice_fails_clearly_without_gpu() {
        if tch::Cuda::is_available() {
            eprintln!("skipped: CUDA is available here, nothing to check about its absence");
            return;
        }
        let e = DeviceChoice::Cuda(0).resolve().unwrap_err();
        assert_eq!(e.to_string(), "device 'cuda:0' asked for, but CUDA is not available on this machine");
        assert_eq!(DeviceChoice::Auto.resolve().unwrap(), tch::Device::Cpu);
    }
}
