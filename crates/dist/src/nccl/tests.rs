//! What of the NCCL backend runs without a GPU: the call descriptors, ids, the file hand-over,
//! loading the library that comes with torch, and the error where no GPU is.

#![allow(unsafe_code)]
use std::path::PathBuf;
use std::time::Duration;

use super::*;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kappa-dist-nccl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn an_id_has_exactly_its_128_bytes() {
    let id = NcclId::from_bytes(&[7u8; UNIQUE_ID_BYTES]).unwrap();
    assert_eq!(id.as_bytes(), &[7u8; UNIQUE_ID_BYTES]);
    let e = NcclId::from_bytes(&[0u8; 12]).unwrap_err();
    assert!(e.to_string().contains("128 bytes, found 12"), "{e}");
    assert_eq!(format!("{id:?}"), "NcclId(..)", "ids are not printed");
}

#[test]
fn the_file_hands_rank_0s_id_to_a_rank_that_waited_for_it() {
    let dir = scratch("file");
    let path = dir.join("nccl-id");
    let waiter = {
        let path = path.clone();
        std::thread::spawn(move || {
            share_bytes_via_file(&path, 1, Duration::from_secs(30), || unreachable!())
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let written = share_bytes_via_file(&path, 0, Duration::ZERO, || Ok([42; UNIQUE_ID_BYTES]));
    assert_eq!(written.unwrap(), [42; UNIQUE_ID_BYTES]);
    assert_eq!(waiter.join().unwrap().unwrap(), [42; UNIQUE_ID_BYTES]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rank_waiting_for_an_id_nobody_writes_fails_after_its_timeout() {
    let dir = scratch("timeout");
    let e = share_bytes_via_file(
        &dir.join("never"),
        3,
        Duration::from_millis(50),
        || unreachable!(),
    )
    .unwrap_err();
    assert!(
        matches!(&e, DistError::Transport { rank: 3, message, .. } if message.contains("did not write")),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The wheel's NCCL next to the libtorch this test runs on, where there is one: the table's
/// symbols resolve and the version decodes.
#[test]
fn the_symbol_table_loads_the_nccl_that_comes_with_torch() {
    let Some(lib) = std::env::var_os("LIBTORCH")
        .map(|t| PathBuf::from(t).join("../nvidia/nccl/lib/libnccl.so.2"))
        .filter(|p| p.is_file())
    else {
        eprintln!("skipped: no NCCL beside libtorch");
        return;
    };
    let api = ffi::load_nccl_from(&[lib.display().to_string()]).unwrap();
    let mut code = 0;
    // SAFETY: ncclGetVersion writes one int.
    assert_eq!(unsafe { (api.get_version)(&mut code) }, ffi::NCCL_SUCCESS);
    assert!(
        code >= 21_800,
        "NCCL {code}: send/receive groups and bf16 need 2.18 or later"
    );
    assert!(
        api.message(5).contains("invalid usage"),
        "{}",
        api.message(5)
    );
}

#[test]
fn without_a_gpu_joining_a_group_is_an_error_not_a_crash() {
    if tch::Cuda::is_available() {
        return;
    }
    let id = NcclId::from_bytes(&[0; UNIQUE_ID_BYTES]).unwrap();
    let e = Nccl::new(&id, 0, 1, 0).unwrap_err();
    assert!(
        matches!(
            e,
            DistError::Transport {
                backend: "NCCL",
                ..
            }
        ),
        "{e}"
    );
    let e = Nccl::new(&id, 2, 2, 0).unwrap_err();
    assert!(matches!(e, DistError::World { world: 2, .. }), "{e}");
}
