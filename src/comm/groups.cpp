#include "comm/groups.h"

#include "core/check.h"

namespace moe {
namespace {

std::string started(int world_size) {
  if (world_size == 1 && !launched_by_mpi()) return "this process runs alone (start the job with mpirun)";
  return fmt::format("mpirun started {}", world_size);
}

}  // namespace

std::string to_string(const ParallelConfig& cfg) {
  return fmt::format("--ep {} --tp {} --dp {}{}", cfg.ep, cfg.tp, cfg.dp,
                     cfg.attn_tp > 1 ? fmt::format(" --attn-tp {}", cfg.attn_tp) : "");
}

void validate_parallel_config(const ParallelConfig& cfg, int world_size) {
  MOE_CHECK(cfg.ep >= 1, "--ep must be at least 1, got {}", cfg.ep);
  MOE_CHECK(cfg.tp >= 1, "--tp must be at least 1, got {}", cfg.tp);
  MOE_CHECK(cfg.dp >= 1, "--dp must be at least 1, got {}", cfg.dp);
  const long long need = static_cast<long long>(cfg.ep) * cfg.tp;
  if (need != world_size) {
    std::string hint;
    if (world_size % cfg.tp == 0) hint = fmt::format(" (with --tp {} use --ep {})", cfg.tp, world_size / cfg.tp);
    MOE_FAIL("--ep {} --tp {} needs {} ranks, {}{}", cfg.ep, cfg.tp, need, started(world_size), hint);
  }
  MOE_CHECK(world_size % cfg.dp == 0, "--dp {} must divide the number of ranks, {}", cfg.dp, started(world_size));
  MOE_CHECK(cfg.attn_tp >= 1, "--attn-tp must be at least 1, got {}", cfg.attn_tp);
  if (cfg.attn_tp > 1) {
    MOE_CHECK(cfg.tp == 1,
              "--attn-tp {} with --tp {}: --attn-tp splits attention over ranks that hold whole experts, --tp "
              "splits attention together with every expert's intermediate size; use one of them",
              cfg.attn_tp, cfg.tp);
    MOE_CHECK(cfg.attn_tp == world_size / cfg.dp,
              "--attn-tp {} must equal the ranks of one DP replica, {} (world {} / --dp {}): attention is split "
              "over the whole replica, which is the EP group when --dp is 1",
              cfg.attn_tp, world_size / cfg.dp, world_size, cfg.dp);
  }
}

ParallelGroups::ParallelGroups(Communicator& world, const ParallelConfig& cfg) : cfg_(cfg), world_(&world) {
  const int n = world.size();
  validate_parallel_config(cfg, n);
  const int r = world.rank();
  tp_rank_ = r % cfg.tp;
  ep_rank_ = r / cfg.tp;
  const int attn_tp = n / cfg.dp;
  dp_rank_ = r / attn_tp;
  attn_tp_rank_ = r % attn_tp;
  // Same order of splits on every rank; keys keep world order inside each group.
  moe_tp_ = world.split(ep_rank_, r, "moe_tp");
  ep_ = world.split(tp_rank_, r, "ep");
  dp_ = world.split(dp_rank_, r, "dp");
  MOE_CHECK(moe_tp_->size() == cfg.tp && moe_tp_->rank() == tp_rank_ && ep_->size() == cfg.ep &&
                ep_->rank() == ep_rank_ && dp_->size() == attn_tp && dp_->rank() == attn_tp_rank_,
            "internal: parallel groups do not match the layout {} on rank {}", to_string(cfg), r);
}

}  // namespace moe
