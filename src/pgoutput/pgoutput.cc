// Anchor translation unit for the pgoutput library (keeps the target non-empty).
namespace pgrelay::pgoutput {
int library_anchor() { return 0; }
}  // namespace pgrelay::pgoutput
