//! The bench's floor program touching per-peer state (`hbm-bench floor --touch`): it must touch
//! exactly the lines an accepted heartbeat of a peer in its own slot touches, where the layout
//! puts them, and nothing for an id it holds no state for, or the bench's limit and its
//! line-by-line rows would measure something else than they say.

use aya::{
    maps::Array,
    programs::{TestRun, TestRunOptions, Xdp},
};
use integration_tests::{
    bench::{Touch, floor::LINES_PER_PEER, load_floor_touching},
    packet::Packet,
    require_root,
};
use monitor_common::wire::DEFAULT_PORT;

/// The peers the floor holds state for in these tests (ids 1 to 10).
const PEERS: u32 = 10;
const XDP_DROP: u32 = 1;

/// Runs the heartbeat of `id` with sequence number `seq` through the program `repeat` times;
/// its verdict.
fn run(ebpf: &mut aya::Ebpf, id: u64, seq: u64, repeat: u32) -> u32 {
    let xdp: &mut Xdp = ebpf
        .program_mut("floor")
        .expect("floor")
        .try_into()
        .expect("XDP");
    let packet = Packet::heartbeat_v4(id, seq).build();
    xdp.test_run(TestRunOptions {
        data_in: Some(&packet),
        repeat,
        ..TestRunOptions::default()
    })
    .expect("BPF_PROG_TEST_RUN")
    .return_value
}

/// FLOOR_STATE's lines, as words, and FLOOR_LAST_HEARD's words.
fn state(ebpf: &aya::Ebpf) -> (Vec<[u64; 8]>, Vec<u64>) {
    let lines: Array<_, [u64; 8]> =
        Array::try_from(ebpf.map("FLOOR_STATE").expect("FLOOR_STATE")).expect("an array");
    let words: Array<_, u64> =
        Array::try_from(ebpf.map("FLOOR_LAST_HEARD").expect("FLOOR_LAST_HEARD")).expect("an array");
    (
        (0..lines.len())
            .map(|i| lines.get(&i, 0).expect("line"))
            .collect(),
        (0..words.len())
            .map(|i| words.get(&i, 0).expect("word"))
            .collect(),
    )
}

/// Indexes of the lines with anything in them.
fn touched(lines: &[[u64; 8]]) -> Vec<u32> {
    (0..lines.len() as u32)
        .filter(|&i| lines[i as usize] != [0; 8])
        .collect()
}

/// Peer 7's lines (hot, first cold, first ring line) in each layout.
fn lines_of_peer_7(touch: Touch) -> (u32, u32, u32) {
    let peer = 6;
    match touch {
        Touch::Hot | Touch::Stores => {
            let at = peer * LINES_PER_PEER;
            (at, at + 1, at + 3)
        }
        Touch::SplitHot | Touch::SplitStores | Touch::SplitLocked | Touch::SplitDue => {
            let rest = PEERS + peer * (LINES_PER_PEER - 1);
            (peer, rest, rest + 2)
        }
        Touch::None | Touch::Packed32 | Touch::Packed32Stores | Touch::Packed16 => unreachable!(),
    }
}

#[test]
fn the_floor_touches_the_lines_a_heartbeat_touches_where_the_layout_puts_them() {
    require_root();
    for touch in [
        Touch::Hot,
        Touch::Stores,
        Touch::SplitHot,
        Touch::SplitStores,
        Touch::SplitLocked,
        Touch::SplitDue,
    ] {
        let mut ebpf = load_floor_touching(DEFAULT_PORT, true, touch, PEERS);
        let (lines, words) = state(&ebpf);
        assert_eq!(lines.len() as u32, PEERS * LINES_PER_PEER, "{touch:?}");
        assert_eq!(words.len() as u32, PEERS, "{touch:?}");
        assert!(
            touched(&lines).is_empty(),
            "{touch:?}: state before any heartbeat"
        );

        // Ids it holds no state for: dropped (the port is the heartbeats'), nothing touched.
        for id in [0, u64::from(PEERS) + 1, u64::MAX] {
            assert_eq!(run(&mut ebpf, id, 1, 1), XDP_DROP, "{touch:?}: id {id}");
        }
        let (lines, words) = state(&ebpf);
        assert!(
            touched(&lines).is_empty(),
            "{touch:?}: an unknown id touched state"
        );
        assert!(words.iter().all(|&w| w == 0), "{touch:?}");

        // Peer 7, three times: its hot line counts them, holds its id, the last arrival and
        // the ring's head; with the stores, the source line, the ring's first line (three
        // entries) and its last-heard word, and nothing else.
        assert_eq!(run(&mut ebpf, 7, 1, 3), XDP_DROP, "{touch:?}");
        let (lines, words) = state(&ebpf);
        let (hot_at, cold_at, ring_at) = lines_of_peer_7(touch);
        let hot = lines[hot_at as usize];
        // Taken and given back three times (`split-locked` by a compare-and-swap): even.
        assert_eq!(hot[0], 6, "{touch:?}: three updates of the lock's word");
        assert_eq!(hot[1], 7, "{touch:?}: the id");
        assert_ne!(hot[2], 0, "{touch:?}: the last arrival");
        assert_eq!(hot[3], 3, "{touch:?}: the ring's head");
        let stores = matches!(
            touch,
            Touch::Stores | Touch::SplitStores | Touch::SplitLocked | Touch::SplitDue
        );
        if stores {
            assert_eq!(touched(&lines), vec![hot_at, cold_at, ring_at], "{touch:?}");
            assert_eq!(lines[cold_at as usize][..2], [7, hot[2]], "{touch:?}");
            let ring: [u32; 16] = unsafe { std::mem::transmute(lines[ring_at as usize]) };
            assert!(
                ring[..3].iter().all(|&e| e != 0) && ring[3..].iter().all(|&e| e == 0),
                "{touch:?}: three ring entries, in order: {ring:?}"
            );
            assert_eq!(
                words,
                (1..=PEERS as u64)
                    .map(|id| if id == 7 { hot[2] } else { 0 })
                    .collect::<Vec<_>>(),
                "{touch:?}: the last-heard word of peer 7 only"
            );
        } else {
            assert_eq!(touched(&lines), vec![hot_at], "{touch:?}");
            assert!(words.iter().all(|&w| w == 0), "{touch:?}");
        }
        let due = due_buckets(&ebpf);
        if touch == Touch::SplitDue {
            // Counted in the hot line's fifth word; the bucket 138 ms (the default floor, the
            // watch left zero) past the last arrival, peer 7's alone.
            assert_eq!(hot[4], 3, "{touch:?}: the heartbeats counted");
            let bucket = ((hot[2] + 138_000_000) >> 22) as u16;
            assert_eq!(
                due,
                (1..=PEERS as u64)
                    .map(|id| if id == 7 { bucket } else { 0 })
                    .chain(std::iter::repeat_n(0, 32 - PEERS as usize))
                    .collect::<Vec<_>>(),
                "{touch:?}: peer 7's due bucket only"
            );
        } else {
            assert_eq!(hot[4], 0, "{touch:?}: nothing counted");
            assert!(due.iter().all(|&b| b == 0), "{touch:?}: no bucket stored");
        }
    }
}

/// FLOOR_DUE's buckets, 32 to an entry.
fn due_buckets(ebpf: &aya::Ebpf) -> Vec<u16> {
    let due: Array<_, [u16; 32]> =
        Array::try_from(ebpf.map("FLOOR_DUE").expect("FLOOR_DUE")).expect("an array");
    (0..due.len())
        .flat_map(|i| due.get(&i, 0).expect("entry"))
        .collect()
}

#[test]
fn the_floors_due_bucket_comes_now_once_the_watchs_span_ran_out() {
    require_root();
    // A watch of peer 7 with a floor of 1 s (in 2^16 ns units) that holds up to its second
    // heartbeat: the first two store the bucket a second on, the third the bucket of now.
    let mut ebpf = load_floor_touching(DEFAULT_PORT, true, Touch::SplitDue, PEERS);
    let floor_units = 1_000_000_000u64 >> 16;
    let mut watch: Array<_, u64> =
        Array::try_from(ebpf.map_mut("FLOOR_WATCH").expect("FLOOR_WATCH")).expect("an array");
    watch.set(6, (2 << 32) | floor_units, 0).expect("set");
    let bucket = |ns: u64| (ns >> 22) as u16;
    for seq in 1..=3 {
        assert_eq!(run(&mut ebpf, 7, seq, 1), XDP_DROP);
        let (lines, _) = state(&ebpf);
        let arrival = lines[6][2];
        let expected = if seq <= 2 {
            bucket(arrival + (floor_units << 16))
        } else {
            bucket(arrival)
        };
        assert_eq!(due_buckets(&ebpf)[6], expected, "heartbeat {seq}");
    }
}

#[test]
fn the_packed_layouts_touch_the_peers_bytes_of_one_line() {
    require_root();
    // Peer 7 (slot 6): 32 bytes a peer, two to a line, is line 3 from word 0 (a count, the
    // id, the last arrival in word 3); 16 bytes, four to a line, is line 1 from word 4 (a
    // count, the last arrival).
    for (touch, line, words) in [
        (Touch::Packed32, 3usize, vec![3, 7, 0, u64::MAX, 0, 0, 0, 0]),
        (Touch::Packed16, 1, vec![0, 0, 0, 0, 3, u64::MAX, 0, 0]),
    ] {
        let mut ebpf = load_floor_touching(DEFAULT_PORT, true, touch, PEERS);
        assert_eq!(run(&mut ebpf, 7, 1, 3), XDP_DROP, "{touch:?}");
        let (lines, last_heard) = state(&ebpf);
        assert_eq!(touched(&lines), vec![line as u32], "{touch:?}");
        for (i, (&got, &want)) in lines[line].iter().zip(&words).enumerate() {
            if want == u64::MAX {
                assert_ne!(got, 0, "{touch:?}: word {i}, the last arrival");
            } else {
                assert_eq!(got, want, "{touch:?}: word {i}");
            }
        }
        assert!(last_heard.iter().all(|&w| w == 0), "{touch:?}: no stores");
    }
    // With the stores: the same hot words, and peer 7's source line, first ring line (three
    // entries) and last-heard word, after the 5 packed lines of 10 peers.
    let mut ebpf = load_floor_touching(DEFAULT_PORT, true, Touch::Packed32Stores, PEERS);
    assert_eq!(run(&mut ebpf, 7, 1, 3), XDP_DROP);
    let (lines, last_heard) = state(&ebpf);
    let rest = PEERS / 2 + 6 * (LINES_PER_PEER - 1);
    assert_eq!(touched(&lines), vec![3, rest, rest + 2]);
    let arrival = lines[3][3];
    assert_eq!(lines[3][..2], [3, 7]);
    assert_eq!(lines[rest as usize][..2], [7, arrival]);
    let ring: [u32; 16] = unsafe { std::mem::transmute(lines[rest as usize + 2]) };
    assert!(
        ring[..3].iter().all(|&e| e != 0) && ring[3..].iter().all(|&e| e == 0),
        "three ring entries, in order: {ring:?}"
    );
    assert_eq!(
        last_heard,
        (1..=PEERS as u64)
            .map(|id| if id == 7 { arrival } else { 0 })
            .collect::<Vec<_>>()
    );
}

#[test]
fn the_floor_without_touch_holds_no_state() {
    require_root();
    let mut ebpf = load_floor_touching(DEFAULT_PORT, true, Touch::None, PEERS);
    assert_eq!(run(&mut ebpf, 7, 1, 1), XDP_DROP);
    let (lines, words) = state(&ebpf);
    assert_eq!(
        (lines.len(), words.len()),
        (1, 1),
        "one placeholder entry each"
    );
    assert!(touched(&lines).is_empty() && words == [0]);
}
