//! Choosing where tensors live: `cpu`, `cuda` or `cuda:N`, with a clear error when CUDA is absent.

use tch::Device;

use crate::error::ModelsError;

/// Parses a device name and checks that the device exists.
///
/// ```
/// let cpu = kappa_models::parse_device("cpu").unwrap();
/// assert_eq!(cpu, tch::Device::Cpu);
/// assert!(kappa_models::parse_device("tpu").is_err());
/// ```
pub fn parse_device(name: &str) -> Result<Device, ModelsError> {
    let index = match name.trim() {
        "cpu" => return Ok(Device::Cpu),
        "cuda" => 0,
        other => other
            .strip_prefix("cuda:")
            .and_then(|i| i.parse::<usize>().ok())
            .ok_or_else(|| ModelsError::UnknownDevice(name.to_string()))?,
    };
    let available = tch::Cuda::device_count().max(0) as usize;
    if index >= available {
        return Err(ModelsError::CudaUnavailable {
            name: name.to_string(),
            available,
        });
    }
    Ok(Device::Cuda(index))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    #[test]
    fn libtorch_runs_a_matrix_product_on_the_cpu() {
        let device = parse_device("cpu").unwrap();
        let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0])
            .reshape([2, 2])
            .to_device(device);
        let b = Tensor::from_slice(&[5.0f32, 6.0, 7.0, 8.0]).reshape([2, 2]);
        let c: Vec<f32> = a.matmul(&b).flatten(0, 1).try_into().unwrap();
        assert_eq!(c, vec![19.0, 22.0, 43.0, 50.0]);
        assert_eq!(a.kind(), Kind::Float);
    }

    #[test]
    fn unknown_and_missing_devices_are_errors() {
        assert!(matches!(
            parse_device("gpu"),
            Err(ModelsError::UnknownDevice(_))
        ));
        assert!(matches!(
            parse_device("cuda:x"),
            Err(ModelsError::UnknownDevice(_))
        ));
        let count = tch::Cuda::device_count() as usize;
        assert!(matches!(
            parse_device(&format!("cuda:{count}")),
            Err(ModelsError::CudaUnavailable { .. })
        ));
    }
}
