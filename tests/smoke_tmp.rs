use std::sync::Arc;
use bulkhead::Semaphore;

#[test]
fn java_example() {
    futures::executor::block_on(async {
        let s = Semaphore::new(8);
        s.add_permits(2);
        let p = s.acquire_many(9).await.unwrap();
        assert_eq!(s.available_permits(), 1);
        s.reduce_permits(7);
        assert_eq!(s.available_permits(), -6);
        drop(p);
        assert_eq!(s.available_permits(), 3);
    });
}

#[test]
fn contended_mt() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    rt.block_on(async {
        let s = Arc::new(Semaphore::new(3));
        let inflight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut hs = vec![];
        for _ in 0..200 {
            let s = s.clone();
            let inflight = inflight.clone();
            hs.push(tokio::spawn(async move {
                for _ in 0..100 {
                    let _p = s.acquire().await.unwrap();
                    let v = inflight.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    assert!(v < 3);
                    tokio::task::yield_now().await;
                    inflight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                }
            }));
        }
        for h in hs { h.await.unwrap(); }
        assert_eq!(s.available_permits(), 3);
        assert_eq!(s.queue_len(), 0);
    });
}

#[test]
fn lost_wakeup() {
    for _ in 0..2000 {
        let s = Arc::new(Semaphore::new(0));
        let a: Vec<_> = (0..2).map(|_| { let s = s.clone(); std::thread::spawn(move || { s.acquire_blocking().unwrap().forget(); }) }).collect();
        let r: Vec<_> = (0..2).map(|_| { let s = s.clone(); std::thread::spawn(move || s.add_permits(1)) }).collect();
        for h in a.into_iter().chain(r) { h.join().unwrap(); }
        assert_eq!(s.available_permits(), 0);
    }
}
