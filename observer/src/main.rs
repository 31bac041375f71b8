fn main() {
    let o = observer::loader::Observer::load(&Default::default()).unwrap();
    println!("{:?}", o.program_ids());
}
