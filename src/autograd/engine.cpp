#include <unordered_set>

#include "shardtensor/autograd/variable.hpp"

namespace shard::autograd {
namespace {
thread_local bool t_grad_enabled = true;
thread_local std::vector<std::function<void()>>* t_finalizers = nullptr;
thread_local std::vector<std::function<void()>> t_outside;  // leaves touched outside run_backward
}  // namespace

bool grad_enabled() noexcept { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }

void at_backward_end(std::function<void()> f) {
  if (t_finalizers) t_finalizers->push_back(std::move(f));
  else t_outside.push_back(std::move(f));
}

void run_backward(const std::shared_ptr<Node>& root) {
  if (!root) {
    std::vector<std::function<void()>> fs;
    std::swap(fs, t_outside);
    for (auto& f : fs) f();
    return;
  }
  // Iterative post-order DFS gives a topological order (parents after children when reversed).
  std::vector<Node*> order;
  std::unordered_set<Node*> seen;
  std::vector<std::pair<Node*, std::size_t>> stack{{root.get(), 0}};
  seen.insert(root.get());
  while (!stack.empty()) {
    auto& [n, i] = stack.back();
    if (i < n->parents.size()) {
      Node* p = n->parents[i++].get();
      if (seen.insert(p).second) stack.emplace_back(p, 0);
    } else {
      order.push_back(n);
      stack.pop_back();
    }
  }
  std::vector<std::function<void()>> finalizers;
  std::swap(finalizers, t_outside);  // the seed's leaf registration, if the loss is a leaf
  t_finalizers = &finalizers;
  struct Reset { ~Reset() { t_finalizers = nullptr; } } reset;
  NoGradGuard no_grad;  // backward steps are not recorded
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    SHARD_CHECK(!n->released, "backward", "node '{}' was already freed by an earlier backward()", n->name);
    if (n->backward) n->backward();
    n->backward = nullptr;
    n->released = true;
  }
  for (auto& f : finalizers) f();
  // Free the graph: drop parent links so memory is returned now.
  for (Node* n : order) n->parents.clear();
}

}  // namespace shard::autograd
