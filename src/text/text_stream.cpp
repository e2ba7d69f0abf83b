#include "text/text_stream.h"

#include <algorithm>

namespace moe::text {

TextStream::TextStream(const Tokenizer& tok, std::vector<std::string> stops, DecodeOptions opt)
    : dec_(tok, opt) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));  // an empty stop would end every request at once
}

TextStream::Piece TextStream::push(int32_t id) {
  if (stopped_) return {};
  pending_ += dec_.push(id);
  return release(false);
}

TextStream::Piece TextStream::finish() {
  if (stopped_) return {};
  pending_ += dec_.finish();
  return release(true);
}

TextStream::Piece TextStream::release(bool final) {
  Piece out;
  // The earliest stop occurrence wins (OpenAI / vLLM: cut at the first match).
  size_t cut = std::string::npos;
  for (const auto& s : stops_) cut = std::min(cut, pending_.find(s));
  if (cut != std::string::npos) {
    out.text = pending_.substr(0, cut);
    out.stopped = stopped_ = true;
  } else {
    // Hold back the longest tail that is a proper prefix of some stop string.
    size_t hold = 0;
    if (!final)
      for (const auto& s : stops_)
        for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
          if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
            hold = k;
            break;
          }
    out.text = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
  }
  if (out.stopped) pending_.clear();
  released_ += out.text;
  return out;
}

}  // namespace moe::text
