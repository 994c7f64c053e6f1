fn main() {
    let q = std::env::args().nth(1).unwrap_or_default();
    let d = trainmem::config::decode_query(&q);
    println!("{}", trainmem::config::encode_query(&d.config));
    for e in d.errors { println!("{e}"); }
}
